// SPDX-License-Identifier: Apache-2.0
//! The doorbell worker: one thread per device running an event-manager
//! loop. Every doorbell the guest rings ends up here, whether KVM signalled
//! the object's eventfd or the UAR MMIO path did, and so do port link
//! changes. Today it validates what the guest claims to have posted, keeps
//! CQ arm state, flushes QPs in the error state and reports link changes;
//! the transport engine will take its work from here.
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

use std::collections::BTreeMap;
use std::os::fd::AsRawFd;
use std::sync::Arc;

use device_worker::Stoppable;
use event_manager::{EventOps, EventSet, Events, MutEventSubscriber};
use log::error;
use vm_memory::GuestAddressSpace;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::objects::qp;
use crate::port::handle_link_change;
use crate::state::Shared;
use crate::uar::{Class, WatchOp};

/// Event data of the worker's own eventfds (object doorbells use
/// `Class::event_data`, whose top byte is 1 to 4).
const KILL_EVENT: u32 = 0xff00_0000;
const WATCH_EVENT: u32 = 0xff00_0001;
const LINK_EVENT: u32 = 0xff00_0002;

#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    #[error("Failed to create a worker eventfd")]
    EventFd(#[source] std::io::Error),
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
    stopped: bool,
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
            stopped: false,
        })
    }

    fn apply_watch_ops(&mut self, ops: &mut EventOps) {
        for op in self.shared.env.hub.take_watch_ops() {
            match op {
                WatchOp::Add { data, fd, gen } => {
                    if let Err(e) = ops.add(Events::with_data(&fd, data, EventSet::IN)) {
                        error!("pvrdma: failed to watch doorbell {data:#x}: {e}");
                        continue;
                    }
                    self.watched.insert(data, Watched { fd, gen });
                }
                WatchOp::Remove { data } => {
                    if let Some(w) = self.watched.remove(&data) {
                        if let Err(e) = ops.remove(Events::with_data(&w.fd, data, EventSet::IN)) {
                            error!("pvrdma: failed to unwatch doorbell {data:#x}: {e}");
                        }
                    }
                }
            }
        }
    }

    /// A doorbell of object `handle`; `gen` says which object it was.
    fn handle_doorbell(&self, class: Class, handle: u32, gen: u64) {
        let mem = self.mem.memory();
        let env = &self.shared.env;
        let mut state = self.shared.lock();
        let Some(session) = state.session.as_mut() else {
            return;
        };
        let events = &mut session.dsr.events;
        let objects = &mut session.objects;
        match class {
            Class::Qp => {
                if objects.qps.get(&handle).is_some_and(|o| o.gen == gen) {
                    qp::handle_doorbell(&*mem, env, events, objects, handle);
                }
            }
            Class::CqArm | Class::CqArmSol => {
                if let Some(cq) = objects.cqs.get_mut(&handle).filter(|o| o.gen == gen) {
                    cq.handle_arm(&*mem, env, events, handle, class == Class::CqArmSol);
                }
            }
            Class::Srq => {
                if let Some(srq) = objects.srqs.get_mut(&handle).filter(|o| o.gen == gen) {
                    srq.handle_doorbell(&*mem, env, events, handle);
                }
            }
        }
    }

    fn handle_link(&self) {
        let mem = self.mem.memory();
        let mut state = self.shared.lock();
        if !state.active {
            return;
        }
        if let Some(session) = state.session.as_mut() {
            handle_link_change(&*mem, &self.shared.env, session);
        }
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
        for (fd, data) in [
            (&self.kill, KILL_EVENT),
            (&self.wake, WATCH_EVENT),
            (&self.link, LINK_EVENT),
        ] {
            if let Err(e) = ops.add(Events::with_data(fd, data, EventSet::IN)) {
                error!("pvrdma: failed to watch worker eventfd {data:#x}: {e}");
            }
        }
    }

    fn process(&mut self, events: Events, ops: &mut EventOps) {
        self.drain_poll();
        match events.data() {
            KILL_EVENT => self.stopped = true,
            WATCH_EVENT => {
                let _ = self.wake.read();
                self.apply_watch_ops(ops);
            }
            LINK_EVENT => {
                let _ = self.link.read();
                self.handle_link();
            }
            data => {
                let Some(w) = self.watched.get(&data) else {
                    return;
                };
                if w.fd.as_raw_fd() != events.fd() {
                    return;
                }
                // The count is irrelevant: one pass handles all of it.
                let _ = w.fd.read();
                let gen = w.gen;
                if let Some((class, handle)) = Class::from_event_data(data) {
                    self.handle_doorbell(class, handle, gen);
                }
            }
        }
    }
}

impl<M: GuestAddressSpace> Stoppable for Worker<M> {
    fn kill_evt(&self) -> &EventFd {
        &self.kill
    }

    fn stopped(&self) -> bool {
        self.stopped
    }
}
