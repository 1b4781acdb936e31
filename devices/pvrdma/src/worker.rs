// SPDX-License-Identifier: Apache-2.0
//! The device's worker: one thread per device running an event-manager
//! loop. Every doorbell the guest rings ends up here, whether KVM signalled
//! the object's eventfd or the UAR MMIO path did, and so do RoCE frames
//! steered off the port, the engine's timer and port link changes. QPs
//! with an engine run through [`datapath::run_qp`]; the others only have
//! their rings validated (or flushed, in the error state). CQ arm state
//! and link changes are kept here too.
//!
//! The eventfds to watch change as objects come and go: the vCPU thread
//! queues [`WatchOp`]s in the [`crate::uar::Hub`] and wakes the worker,
//! which applies them in order. Each watched eventfd remembers the
//! generation of its object, so a doorbell that was pending when the
//! object was destroyed never reaches a new object with the same handle.
#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use std::collections::{BTreeMap, BTreeSet};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use device_worker::{Poll, Stoppable};
use event_manager::{EventOps, EventSet, Events, MutEventSubscriber};
use log::error;
use pvrdma_abi::verbs::qp_state;
use rdma_transport::net::{gid_from_ip, RoceVersion};
use rdma_transport::packet::{parse, Packet, ParseError};
use vm_memory::GuestAddressSpace;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};
use vmm_sys_util::timerfd::TimerFd;

use crate::datapath::local::{Batch, KickWatch, Wake};
use crate::datapath::{self, Input, SEGMENT_ROOM};

use crate::datapath::wire::Wire;
use crate::env::Env;
use crate::events::EventRings;
use crate::metrics::Metrics;
use crate::objects::gid::Accept;
use crate::objects::{qp, Objects};
use crate::port::handle_link_change;
use crate::state::Shared;
use crate::uar::{Class, WatchOp};

/// Event data of the worker's own eventfds (object doorbells use
/// `Class::event_data`, whose top byte is 1 to 4).
const KILL_EVENT: u32 = 0xff00_0000;
const WATCH_EVENT: u32 = 0xff00_0001;
const LINK_EVENT: u32 = 0xff00_0002;
const INBOX_EVENT: u32 = 0xff00_0003;
const TIMER_EVENT: u32 = 0xff00_0004;
const KICK_EVENT: u32 = 0xff00_0005;
const LOCAL_EVENT: u32 = 0xff00_0006;
const LOCAL_AGAIN_EVENT: u32 = 0xff00_0007;
/// A peer's kick of a same-host ring (all of them share this value).
const LOCAL_RING_EVENT: u32 = 0xff00_0008;
/// Frames taken from the inbox per wake-up before other events get a turn.
const RX_BATCH: usize = 256;
/// How doorbell eventfds and same-host ring kicks are watched:
/// edge-triggered, and never read. Their count does not matter (one pass
/// handles all the work), and every signal reports an edge; not reading
/// spares the latency path a system call per wake-up (and a peer's kick
/// must not be read at all, see `datapath::local`).
const EDGE: EventSet = EventSet::IN.union(EventSet::EDGE_TRIGGERED);
/// Shortest timer the worker arms, so an overdue deadline cannot spin it.
const MIN_TIMER: Duration = Duration::from_micros(100);

#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    #[error("Failed to create a worker eventfd")]
    EventFd(#[source] std::io::Error),
    #[error("Failed to create the engine timer")]
    Timer(#[source] std::io::Error),
    #[error(transparent)]
    Start(#[from] device_worker::SpawnError),
}

/// An eventfd the worker watches for one object.
#[derive(Debug)]
struct Watched {
    fd: Arc<EventFd>,
    gen: u64,
}

pub(crate) struct Worker<M> {
    mem: M,
    shared: Arc<Shared>,
    kill: EventFd,
    wake: EventFd,
    link: EventFd,
    watched: BTreeMap<u32, Watched>,
    /// The engine's retransmission/RNR timer, armed for the earliest
    /// deadline of any QP.
    timer: TimerFd,
    /// Wakes the worker for QPs whose budget ran out.
    kick: EventFd,
    busy: BTreeSet<u32>,
    /// Some of `busy` wait for room in a same-host ring.
    deferred: bool,
    /// The deadline the timer is armed for.
    armed: Option<u64>,
    /// Frames to send once the state lock is released.
    outgoing: Vec<Vec<u8>>,
    /// The buffer same-host frames are received into, reused.
    rx: Batch,
    /// When the worker last did data-path work, while it busy-polls
    /// (`PvrdmaConfig::busy_poll`).
    worked_at: Option<Instant>,
    /// Doorbells that reached the device while paused, by event data, with
    /// their object's generation: taken once it runs again. A destination
    /// VMM's vCPUs run a moment before its devices resume, and a doorbell
    /// rung then must not be lost: QPs with an engine run on resume anyway,
    /// but a CQ's ARM, an SRQ's doorbell or that of a QP without an engine
    /// would be.
    held: BTreeMap<u32, u64>,
    stopped: bool,
}

/// A timerfd whose read never blocks: the worker may re-arm it between
/// epoll reporting an expiry and the read, which would then wait for the
/// new deadline.
fn nonblocking_timer() -> Result<TimerFd, SpawnError> {
    let timer = TimerFd::new().map_err(|e| SpawnError::Timer(e.into()))?;
    // SAFETY: F_SETFL on a descriptor this function owns, with a flag
    // argument; no memory is passed.
    let rc = unsafe { libc::fcntl(timer.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK) };
    if rc < 0 {
        return Err(SpawnError::Timer(std::io::Error::last_os_error()));
    }
    Ok(timer)
}

/// Whether QP `handle`, left with work, is to wait: its peer's same-host
/// ring has no room for a segment, or frames to it wait for room. Running
/// it would only pile up more in the backlog, a copy more each (and a
/// full backlog drops them: a lost READ response costs the whole READ
/// again; 16 QPs each reading 1 MiB used to end in retry-exceeded that
/// way). QPs towards other peers, or the wire, go on; so does a QP in
/// the error state, which sends nothing and flushes its WQEs (a peer that
/// stopped reading must not hold back their error completions).
fn waits_for_room(wire: &Wire, objects: &Objects, handle: u32) -> bool {
    let Some(local) = wire.local.as_ref() else {
        return false;
    };
    objects
        .qps
        .get(&handle)
        .and_then(|qp| qp.engine.as_ref())
        .filter(|e| !e.is_error())
        .map(|e| e.attrs())
        .is_some_and(|a| {
            !a.ud
                && local
                    .room_to(a.addr.dst_mac, SEGMENT_ROOM)
                    .is_some_and(|r| r < SEGMENT_ROOM)
        })
}

/// The QP a received packet is for, if it is ours (its destination GID
/// is one of ours, of the packet's RoCE version and on its VLAN), has an
/// engine and is in a receiving state.
fn receiving_qp(objects: &Objects, metrics: &Metrics, pkt: &Packet<'_>) -> Option<u32> {
    let encap = pkt.layers.encap;
    if encap.version == RoceVersion::V1 {
        metrics.roce_rx_v1.inc();
    }
    if encap.vlan.is_some() {
        metrics.roce_rx_vlan.inc();
    }
    match objects.gids.accepts(&gid_from_ip(pkt.layers.ip.dst), encap) {
        Accept::Yes => {}
        Accept::WrongVlan => {
            metrics.roce_rx_vlan_mismatch.inc();
            return None;
        }
        Accept::No => return None,
    }
    let handle = objects.qpns.get(&pkt.hdrs.bth.dqpn).copied()?;
    let qp = objects.qps.get(&handle)?;
    let receiving = matches!(qp.state, qp_state::RTR | qp_state::RTS | qp_state::SQD);
    (qp.engine.is_some() && receiving).then_some(handle)
}

impl<M: GuestAddressSpace> Worker<M> {
    /// `link` is signalled by the port listener on link changes.
    pub(crate) fn new(mem: M, shared: Arc<Shared>, link: EventFd) -> Result<Self, SpawnError> {
        let wake = shared
            .env
            .hub
            .wake
            .try_clone()
            .map_err(SpawnError::EventFd)?;
        Ok(Self {
            mem,
            shared,
            kill: EventFd::new(EFD_NONBLOCK).map_err(SpawnError::EventFd)?,
            wake,
            link,
            watched: BTreeMap::new(),
            timer: nonblocking_timer()?,
            kick: EventFd::new(EFD_NONBLOCK).map_err(SpawnError::EventFd)?,
            busy: BTreeSet::new(),
            deferred: false,
            armed: None,
            outgoing: Vec::new(),
            rx: Batch::default(),
            worked_at: None,
            held: BTreeMap::new(),
            stopped: false,
        })
    }

    /// Applies the queued watch changes; returns how many it added.
    fn apply_watch_ops(&mut self, ops: &mut EventOps) -> usize {
        let mut added = 0usize;
        for op in self.shared.env.hub.take_watch_ops() {
            match op {
                WatchOp::Add { data, fd, gen } => {
                    if let Err(e) = ops.add(Events::with_data(&fd, data, EDGE)) {
                        error!("pvrdma: failed to watch doorbell {data:#x}: {e}");
                        continue;
                    }
                    self.watched.insert(data, Watched { fd, gen });
                    added = added.saturating_add(1);
                }
                WatchOp::Remove { data } => {
                    if let Some(w) = self.watched.remove(&data) {
                        if let Err(e) = ops.remove(Events::with_data(&w.fd, data, EDGE)) {
                            error!("pvrdma: failed to unwatch doorbell {data:#x}: {e}");
                        }
                    }
                }
            }
        }
        added
    }

    /// Runs QP `handle` for `input` at `now`, then takes what the run
    /// left: frames to send, more work.
    #[allow(clippy::too_many_arguments)]
    fn run_qp(
        &mut self,
        mem: &M::M,
        env: &Env,
        events: &mut EventRings,
        objects: &mut Objects,
        handle: u32,
        now: u64,
        input: Input<'_>,
    ) {
        let wire = &self.shared.wire;
        let out = datapath::run_qp(mem, env, wire, events, objects, handle, now, input);
        let frames = self.shared.route(&objects.gids, out.frames);
        self.outgoing.extend(frames);
        if out.more && self.busy.insert(handle) {
            if let Err(e) = self.kick.write(1) {
                error!("pvrdma: failed to requeue QP {handle}: {e}");
            }
        }
    }

    /// Runs `f` on the session (its event rings and objects) under the
    /// state lock; does nothing without a session, or before ACTIVATE if
    /// `active_only`. False if the device is paused (nothing ran).
    fn with_session(
        &mut self,
        active_only: bool,
        f: impl FnOnce(&mut Self, &M::M, &Env, &mut EventRings, &mut Objects),
    ) -> bool {
        let mem = self.mem.memory();
        let shared = Arc::clone(&self.shared);
        let mut state = shared.lock();
        if shared.paused.load(std::sync::atomic::Ordering::Acquire) {
            return false;
        }
        let active = state.active;
        let Some(session) = state.session.as_mut().filter(|_| active || !active_only) else {
            return true;
        };
        f(
            self,
            &mem,
            &shared.env,
            &mut session.dsr.events,
            &mut session.objects,
        );
        true
    }

    /// A doorbell of object `handle`; `gen` says which object it was.
    fn handle_doorbell(&mut self, class: Class, handle: u32, gen: u64) {
        let ran = self.with_session(false, |w, mem, env, events, objects| match class {
            Class::Qp => match objects.qps.get(&handle).filter(|o| o.gen == gen) {
                Some(o) if o.engine.is_some() => {
                    env.metrics.doorbell_qp.inc();
                    let now = env.clock.now();
                    w.run_qp(mem, env, events, objects, handle, now, Input::Kick);
                }
                Some(_) => qp::handle_doorbell(mem, env, events, objects, handle),
                None => {}
            },
            Class::CqArm | Class::CqArmSol => {
                if let Some(cq) = objects.cqs.get_mut(&handle).filter(|o| o.gen == gen) {
                    env.metrics.doorbell_cq_arm.inc();
                    cq.arm(mem, env, events, handle, class == Class::CqArmSol);
                }
            }
            Class::Srq => {
                if let Some(srq) = objects.srqs.get_mut(&handle).filter(|o| o.gen == gen) {
                    srq.handle_doorbell(mem, env, events, handle);
                }
            }
        });
        if !ran {
            self.shared.env.metrics.doorbell_held.inc();
            self.held.insert(class.event_data(handle), gen);
        }
    }

    /// Frames steered to the device: each goes to the QP it names, if
    /// that QP is ours, has an engine and is in a receiving state.
    fn handle_inbox(&mut self) {
        let frames = self.shared.wire.inbox.take(RX_BATCH);
        self.with_session(true, |w, mem, env, events, objects| {
            w.receive(mem, env, events, objects, frames.iter().map(|f| parse(f)));
        });
        let inbox = &self.shared.wire.inbox;
        inbox.give_back(frames);
        if !inbox.is_empty() {
            // Come back after the other events.
            if let Err(e) = inbox.evt.write(1) {
                error!("pvrdma: failed to requeue received frames: {e}");
            }
        }
    }

    /// Received frames, as parsed: each goes to the QP it names, if that
    /// QP is ours, has an engine and is in a receiving state; consecutive
    /// frames for one QP go in one engine run.
    fn receive<'f>(
        &mut self,
        mem: &M::M,
        env: &Env,
        events: &mut EventRings,
        objects: &mut Objects,
        parsed: impl Iterator<Item = Result<Packet<'f>, ParseError>>,
    ) {
        let mut run: Vec<Packet<'f>> = Vec::new();
        let mut current = None;
        objects.gids.sync(&env.port);
        for p in parsed {
            env.metrics.roce_rx.inc();
            let pkt = match p {
                Ok(pkt) => pkt,
                Err(e) => {
                    guest_warn!(env.metrics.roce_rx_bad, "received frame dropped: {e}");
                    continue;
                }
            };
            let Some(handle) = receiving_qp(objects, &env.metrics, &pkt) else {
                env.metrics.roce_rx_no_qp.inc();
                continue;
            };
            if current != Some(handle) {
                if let Some(h) = current {
                    let now = env.clock.now();
                    self.run_qp(mem, env, events, objects, h, now, Input::Packets(&run));
                }
                run.clear();
                current = Some(handle);
            }
            run.push(pkt);
        }
        if let Some(h) = current {
            let now = env.clock.now();
            self.run_qp(mem, env, events, objects, h, now, Input::Packets(&run));
        }
    }

    /// Frames from VMMs of this host: received like steered ones, but
    /// unsealed (they never crossed a wire).
    fn handle_local(&mut self, wake: Wake) {
        let shared = Arc::clone(&self.shared);
        let Some(local) = shared.wire.local.as_ref() else {
            return;
        };
        let mut batch = std::mem::take(&mut self.rx);
        local.recv(RX_BATCH, wake, &mut batch);
        let n = batch.len() as u64;
        shared.env.metrics.roce_local_rx.add(n);
        let described = batch.described_count() as u64;
        shared.env.metrics.roce_local_rx_described.add(described);
        match shared.wire.inbox.admits() {
            Some(true) => {
                self.with_session(true, |w, mem, env, events, objects| {
                    w.receive(mem, env, events, objects, batch.packets());
                });
            }
            Some(false) => {
                shared.env.metrics.roce_rx_dropped.add(n);
            }
            None => {
                shared.env.metrics.roce_rx_bad.add(n);
            }
        }
        batch.release();
        self.rx = batch;
    }

    /// Runs the QPs whose deadline passed, and those left with work.
    fn handle_timer_or_kick(&mut self, kick: bool) {
        let busy = if kick {
            let _ = self.kick.read();
            std::mem::take(&mut self.busy)
        } else {
            let _ = self.timer.wait();
            self.armed = None;
            BTreeSet::new()
        };
        self.with_session(false, |w, mem, env, events, objects| {
            let now = env.clock.now();
            let due: Vec<(u32, Input<'_>)> = if kick {
                let (wait, run): (Vec<u32>, Vec<u32>) = busy
                    .into_iter()
                    .partition(|&h| waits_for_room(&w.shared.wire, objects, h));
                if !wait.is_empty() {
                    w.busy.extend(wait);
                    w.deferred = true;
                }
                run.into_iter().map(|h| (h, Input::Kick)).collect()
            } else {
                objects
                    .qps
                    .iter()
                    .filter(|(_, qp)| {
                        qp.engine
                            .as_ref()
                            .and_then(|e| e.deadline())
                            .is_some_and(|d| d <= now)
                    })
                    .map(|(&h, _)| (h, Input::Timer))
                    .collect()
            };
            for (handle, input) in due {
                w.run_qp(mem, env, events, objects, handle, now, input);
            }
        });
    }

    /// Whether frames wait for room in a same-host ring (the worker then
    /// polls them on its timer, see [`Worker::rearm_timer`]).
    fn channel_backlogged(&self) -> bool {
        self.shared
            .wire
            .local
            .as_ref()
            .is_some_and(|l| l.backlogged())
    }

    /// Whether a same-host ring has no room for a segment, or frames wait
    /// for room: QPs deferred for room wait for more room (the next piece
    /// of work, see [`Worker::finish`]) or the timer then.
    fn channel_short(&self) -> bool {
        self.shared
            .wire
            .local
            .as_ref()
            .is_some_and(|l| l.short_of(SEGMENT_ROOM))
    }

    /// Runs every QP that has an engine (resume, restore), after the CQs
    /// a restore arms again and the doorbells held while paused; returns
    /// how many QPs it ran.
    fn handle_kick_all(&mut self) -> usize {
        use std::sync::atomic::Ordering;
        if self.shared.rearm_cqs.load(Ordering::Acquire)
            && self.with_session(false, |_, mem, env, events, objects| {
                for (&handle, cq) in &mut objects.cqs {
                    cq.rearm_restored(mem, env, events, handle);
                }
            })
        {
            self.shared.rearm_cqs.store(false, Ordering::Release);
        }
        if !self.shared.paused.load(Ordering::Acquire) && !self.held.is_empty() {
            let held: Vec<String> = self
                .held
                .keys()
                .filter_map(|&d| Class::from_event_data(d))
                .map(|(class, handle)| format!("{class:?} {handle}"))
                .collect();
            log::info!(
                "pvrdma: taking the doorbells rung while paused: {}",
                held.join(", ")
            );
            for (data, gen) in std::mem::take(&mut self.held) {
                if let Some((class, handle)) = Class::from_event_data(data) {
                    self.handle_doorbell(class, handle, gen);
                }
            }
        }
        let all: Vec<u32> = {
            let state = self.shared.lock();
            state
                .session
                .as_ref()
                .map(|s| {
                    s.objects
                        .qps
                        .iter()
                        .filter(|(_, q)| q.engine.is_some())
                        .map(|(&h, _)| h)
                        .collect()
                })
                .unwrap_or_default()
        };
        let n = all.len();
        self.busy.extend(all);
        self.handle_timer_or_kick(true);
        self.handle_link();
        self.announce();
        n
    }

    /// Offers a same-host ring to the peer of every connected QP that has
    /// none yet (frames the QPs just sent made theirs), once resumed (see
    /// [`Shared::announce`]).
    fn announce(&self) {
        use std::sync::atomic::Ordering;
        let Some(local) = self.shared.wire.local.as_ref() else {
            return;
        };
        if self.shared.paused.load(Ordering::Acquire)
            || !self.shared.announce.swap(false, Ordering::AcqRel)
        {
            return;
        }
        let t0 = std::time::Instant::now();
        let peers: BTreeSet<[u8; 6]> = {
            let state = self.shared.lock();
            state
                .session
                .iter()
                .flat_map(|s| s.objects.qps.values())
                .filter_map(|qp| qp.engine.as_ref().map(|e| e.attrs()))
                .filter(|a| !a.ud)
                .map(|a| a.addr.dst_mac)
                .collect()
        };
        let n = peers.len();
        local.announce(peers);
        log::info!(
            "pvrdma: same-host rings offered to {n} peers in {} ms",
            t0.elapsed().as_millis()
        );
    }

    /// Arms the timer for the earliest engine deadline (or, while frames
    /// or QPs wait for room in a same-host ring, for [`MIN_TIMER`] from now) when
    /// that is sooner than it is armed for. A later or vanished deadline leaves it
    /// armed: the early expiry finds nothing due and re-arms, which costs
    /// less than two timerfd calls per message (arm on send, disarm on
    /// ACK) on the latency path.
    fn rearm_timer(&mut self) {
        let state = self.shared.lock();
        let paused = self
            .shared
            .paused
            .load(std::sync::atomic::Ordering::Acquire);
        let engines = state.session.as_ref().filter(|_| !paused).and_then(|s| {
            s.objects
                .qps
                .values()
                .filter_map(|qp| qp.engine.as_ref().and_then(|e| e.deadline()))
                .min()
        });
        drop(state);
        // Frames or QPs waiting for room in a same-host ring: soon.
        let now = self.shared.env.clock.now();
        let backlog = (self.deferred || self.channel_backlogged())
            .then(|| now.saturating_add(MIN_TIMER.as_nanos() as u64));
        let next = engines.into_iter().chain(backlog).min();
        let Some(deadline) = next.filter(|&n| self.armed.is_none_or(|a| n < a)) else {
            return;
        };
        self.armed = Some(deadline);
        let wait = deadline.saturating_sub(self.shared.env.clock.now());
        let result = self
            .timer
            .reset(Duration::from_nanos(wait).max(MIN_TIMER), None);
        if let Err(e) = result {
            error!("pvrdma: failed to arm the engine timer: {e}");
        }
    }

    /// Reports a change of the port's link, unless paused: a paused
    /// device writes no guest memory (a migration's last pass is over), so
    /// a change meanwhile is reported at [`Self::handle_kick_all`].
    fn handle_link(&self) {
        let mem = self.mem.memory();
        let mut state = self.shared.lock();
        if !state.active
            || self
                .shared
                .paused
                .load(std::sync::atomic::Ordering::Acquire)
        {
            return;
        }
        if let Some(session) = state.session.as_mut() {
            handle_link_change(&*mem, &self.shared.env, session);
        }
    }

    /// Watches the kicks of same-host rings that arrived, and unwatches
    /// those of rings that went, before they close.
    fn apply_kick_watch(&self, ops: &mut EventOps) {
        let Some(local) = self.shared.wire.local.as_ref() else {
            return;
        };
        for change in local.take_watch() {
            let result = match &change {
                KickWatch::Add(fd) => ops.add(Events::with_data_raw(*fd, LOCAL_RING_EVENT, EDGE)),
                KickWatch::Remove(file) => ops.remove(Events::with_data_raw(
                    file.as_raw_fd(),
                    LOCAL_RING_EVENT,
                    EDGE,
                )),
            };
            if let Err(e) = result {
                error!("pvrdma: same-host ring kick {change:?}: {e}");
            }
        }
    }

    /// What follows every piece of work, once the state lock is released:
    /// frames sent and same-host peers kicked, QPs that waited for room
    /// resumed (on each poll of the backlog, `timer`, or once it is gone),
    /// and the timer re-armed.
    fn finish(&mut self, timer: bool) {
        self.shared.send(std::mem::take(&mut self.outgoing));
        if self.deferred && (timer || !self.channel_short()) {
            self.deferred = false;
            if let Err(e) = self.kick.write(1) {
                error!("pvrdma: failed to resume QPs with work: {e}");
            }
        }
        self.rearm_timer();
    }

    /// Frames found in the same-host rings without a kick (the worker had
    /// not announced a sleep). Rings that came or went are (un)watched on
    /// the next event: none comes or goes on this path but a corrupt one,
    /// whose descriptor stays open until then.
    fn take_local(&mut self) -> Poll {
        self.handle_local(Wake::Ring);
        self.worked_at = Some(Instant::now());
        self.finish(false);
        Poll::Worked
    }

    /// POLL doorbells are only counted, in bulk, whenever the worker runs.
    fn drain_poll(&self) {
        if let Ok(n) = self.shared.env.hub.poll.read() {
            self.shared.env.metrics.doorbell_cq_poll.add(n);
        }
    }
}

impl<M: GuestAddressSpace> MutEventSubscriber for Worker<M> {
    fn init(&mut self, ops: &mut EventOps) {
        let inbox = Arc::clone(&self.shared.wire.inbox);
        for (fd, data) in [
            (&self.kill, KILL_EVENT),
            (&self.wake, WATCH_EVENT),
            (&self.link, LINK_EVENT),
            (&self.kick, KICK_EVENT),
        ] {
            if let Err(e) = ops.add(Events::with_data(fd, data, EventSet::IN)) {
                error!("pvrdma: failed to watch worker eventfd {data:#x}: {e}");
            }
        }
        // Like a doorbell: the count does not matter (one pass takes a
        // batch, and requeues itself while frames are left), so it is
        // never read; a system call less per wake-up on the wire path.
        if let Err(e) = ops.add(Events::with_data(&inbox.evt, INBOX_EVENT, EDGE)) {
            error!("pvrdma: failed to watch the inbox: {e}");
        }
        if let Err(e) = ops.add(Events::with_data(&self.timer, TIMER_EVENT, EventSet::IN)) {
            error!("pvrdma: failed to watch the engine timer: {e}");
        }
        if let Some(local) = self.shared.wire.local.as_ref() {
            for (fd, wake) in local.fds() {
                let data = match wake {
                    Wake::Socket => LOCAL_EVENT,
                    Wake::Again | Wake::Ring => LOCAL_AGAIN_EVENT,
                };
                if let Err(e) = ops.add(Events::with_data_raw(fd, data, EventSet::IN)) {
                    error!("pvrdma: failed to watch the same-host channel: {e}");
                }
            }
        }
        self.apply_kick_watch(ops);
    }

    fn process(&mut self, events: Events, ops: &mut EventOps) {
        let data = events.data();
        // The data path's own wake-ups leave the POLL count for later: a
        // system call less on the latency path.
        let data_path = matches!(
            data,
            INBOX_EVENT | LOCAL_EVENT | LOCAL_AGAIN_EVENT | LOCAL_RING_EVENT
        ) || matches!(Class::from_event_data(data), Some((Class::Qp, _)));
        if !data_path {
            self.drain_poll();
        }
        match data {
            KILL_EVENT => self.stopped = true,
            WATCH_EVENT => {
                use std::sync::atomic::Ordering;
                let _ = self.wake.read();
                let t0 = Instant::now();
                let watched = self.apply_watch_ops(ops);
                if self.shared.kick_all.swap(false, Ordering::AcqRel) {
                    let ran = self.handle_kick_all();
                    // After a migration's start: the guest runs meanwhile.
                    if !self.shared.paused.load(Ordering::Acquire) {
                        log::info!(
                            "pvrdma: worker resumed: {watched} doorbells watched, {ran} QPs run in \
                             {} ms",
                            t0.elapsed().as_millis()
                        );
                    }
                }
            }
            LINK_EVENT => {
                let _ = self.link.read();
                self.handle_link();
            }
            INBOX_EVENT => self.handle_inbox(),
            LOCAL_EVENT | LOCAL_AGAIN_EVENT | LOCAL_RING_EVENT => {
                self.handle_local(match data {
                    LOCAL_EVENT => Wake::Socket,
                    LOCAL_AGAIN_EVENT => Wake::Again,
                    _ => Wake::Ring,
                });
                // Rings that came or went (corrupt ones on any wake-up).
                self.apply_kick_watch(ops);
            }
            TIMER_EVENT => self.handle_timer_or_kick(false),
            KICK_EVENT => self.handle_timer_or_kick(true),
            data => {
                let Some(w) = self.watched.get(&data) else {
                    return;
                };
                if w.fd.as_raw_fd() != events.fd() {
                    return;
                }
                let gen = w.gen;
                if let Some((class, handle)) = Class::from_event_data(data) {
                    self.handle_doorbell(class, handle, gen);
                }
            }
        }
        if data_path {
            self.worked_at = Some(Instant::now());
        }
        self.finish(data == TIMER_EVENT);
    }
}

impl<M: GuestAddressSpace> Stoppable for Worker<M> {
    fn kill_evt(&self) -> &EventFd {
        &self.kill
    }

    fn stopped(&self) -> bool {
        self.stopped
    }

    /// Busy-polls for `busy_poll` after data-path work: frames in the
    /// same-host rings are taken from shared memory (their producers do
    /// not kick a consumer that has not announced a sleep), everything
    /// else the loop finds without sleeping; the CPU is yielded between
    /// looks. Then the rings are told we sleep, and the loop sleeps.
    fn before_wait(&mut self) -> Poll {
        let shared = Arc::clone(&self.shared);
        let local = shared.wire.local.as_ref();
        if local.is_some_and(|l| l.pending()) {
            return self.take_local();
        }
        let spin = shared.env.config.busy_poll;
        // Also while QPs wait for room in a peer's ring: the peer's ACKs
        // (in our ring, taken without a kick while we poll) make the room,
        // and each resumes them (`finish`); asleep, the worker waited for
        // a kick of each or for its timer.
        let polling = self.worked_at.is_some_and(|t| t.elapsed() < spin);
        if polling {
            let yielded = Instant::now();
            std::thread::yield_now();
            if yielded.elapsed() > shared.env.config.busy_yield {
                // Other threads want this CPU: sleep, so that a kick wakes
                // us ahead of them, rather than poll behind them.
                self.worked_at = None;
            }
            return Poll::Spin;
        }
        self.worked_at = None;
        if local.is_some_and(|l| l.prepare_to_sleep()) {
            // Frames came in as we announced the sleep.
            return self.take_local();
        }
        Poll::Sleep
    }
}
