// SPDX-License-Identifier: Apache-2.0
//! What a device's objects, data path and commands share and never change
//! after construction: the configuration, the port, interrupts, counters,
//! the doorbell hub and the engine's clock. Frames in and out (the wire)
//! are not here: only the worker and the command channel send them.
#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use std::sync::Arc;

use net_port::Port;

use crate::config::PvrdmaConfig;
use crate::events::Interrupts;
use crate::metrics::Metrics;
use crate::uar::Hub;

/// What never changes after construction.
#[derive(Debug)]
pub(crate) struct Env {
    pub(crate) config: PvrdmaConfig,
    pub(crate) port: Arc<Port>,
    pub(crate) irq: Interrupts,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) hub: Arc<Hub>,
    pub(crate) clock: Clock,
}

/// The engine's clock: nanoseconds since the device was created.
#[derive(Debug)]
pub(crate) struct Clock(std::time::Instant);

impl Clock {
    pub(crate) fn new() -> Self {
        Self(std::time::Instant::now())
    }

    pub(crate) fn now(&self) -> u64 {
        u64::try_from(self.0.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
}
