// SPDX-License-Identifier: Apache-2.0
//! The device state shared by the vCPU thread (register writes, commands)
//! and the worker thread (doorbells, link changes): the environment, the
//! wire and, under one lock, the registers and the session.
//!
//! Lock order: [`Shared::state`], then the MSI-X table inside
//! [`Interrupts`]. Nothing that holds the MSI-X lock takes the state lock.
#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use std::sync::atomic::AtomicBool;
use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::datapath::wire::Wire;
use crate::env::Env;
use crate::objects::gid::GidTable;
use crate::objects::qp::saved::Ahead;
use crate::objects::session::Session;

/// ERR before the first successful CTL (QEMU's value): "not ready".
pub(crate) const ERR_NOT_READY: u32 = 0xffff;

#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) env: Env,
    /// Frames in and out: the port's backend, the inbox and the same-host
    /// channel.
    pub(crate) wire: Wire,
    pub(crate) state: Mutex<State>,
    /// Quiesced for a snapshot or migration: the worker takes no work and
    /// received frames are discarded until resume.
    pub(crate) paused: AtomicBool,
    /// Set once resumed with the vCPUs running (`Pausable::released`), or
    /// by a restore of a running device: every QP is run once, for the
    /// work posted while nothing ran.
    pub(crate) kick_all: AtomicBool,
    /// Set on resume: once it has run every QP ([`Shared::kick_all`]) the
    /// worker offers a same-host ring to each connected QP's peer that has
    /// none yet. A migrated VM's new home tells its peers so early, off
    /// the path the guest waits on (the VM's start): handing a ring over
    /// (`connect`, `sendmsg` with two descriptors) lets the peer's VMM run.
    pub(crate) announce: AtomicBool,
    /// Set on restore: every CQ the guest has armed and that is unarmed is
    /// armed again once the device runs (see `Cq::rearm_restored`).
    pub(crate) rearm_cqs: AtomicBool,
}

impl Shared {
    /// Routes frames the engine emitted (see [`Wire::route`]); the caller
    /// sends what is returned once it has released the state lock.
    pub(crate) fn route(&self, gids: &GidTable, frames: Vec<Vec<u8>>) -> Vec<Vec<u8>> {
        self.wire.route(gids, &self.env.metrics, frames)
    }

    /// Sends routed frames (see [`Wire::send`]); never under the state
    /// lock: the same-host channel may wait for a receiver.
    pub(crate) fn send(&self, frames: Vec<Vec<u8>>) {
        self.wire.send(&self.env.metrics, frames);
    }

    /// Asks the worker to run every QP once (see the field `kick_all`).
    pub(crate) fn kick_all(&self) {
        self.kick_all
            .store(true, std::sync::atomic::Ordering::Release);
        self.env.hub.wake_worker();
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Registers and the current session.
#[derive(Debug)]
pub(crate) struct State {
    /// The ERR register.
    pub(crate) err: u32,
    /// DSRLOW, waiting for DSRHIGH.
    pub(crate) dsr_low: u32,
    /// Set on ACTIVATE, cleared on RESET.
    pub(crate) active: bool,
    /// Where doorbell ioeventfds go: BAR2's base while memory decoding is
    /// on, else nowhere.
    pub(crate) uar_base: Option<u64>,
    pub(crate) session: Option<Session>,
    /// A migration's destination: the QPs' parts its source sent ahead
    /// (`snapshot::prepare`), which the restore takes.
    pub(crate) ahead: Ahead,
}

impl State {
    pub(crate) fn new() -> Self {
        Self {
            err: ERR_NOT_READY,
            dsr_low: 0,
            active: false,
            uar_base: None,
            session: None,
            ahead: Ahead::default(),
        }
    }
}
