// SPDX-License-Identifier: Apache-2.0
//! A session, everything from a DSR load to RESET, and the context every
//! command handler gets: the session, guest memory and the environment.
#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use super::Objects;
use crate::dsr::LoadedDsr;
use crate::env::Env;
use crate::metrics::Metrics;
use crate::namespace::Namespace;

/// Everything from a DSR load to RESET: dropping it drops every object,
/// mapping and doorbell registration.
#[derive(Debug)]
pub(crate) struct Session {
    pub(crate) dsr: LoadedDsr,
    pub(crate) ns: Namespace,
    pub(crate) objects: Objects,
    /// The port state last reported to the guest.
    pub(crate) link_up: bool,
}

/// What a command handler works with.
pub(crate) struct Ctx<'a, M> {
    pub(crate) mem: &'a M,
    pub(crate) env: &'a Env,
    pub(crate) s: &'a mut Session,
    /// BAR2's guest-physical base (for UAR PFNs), decoding or not.
    pub(crate) bar2: Option<u64>,
    /// Where new doorbells are registered.
    pub(crate) uar_base: Option<u64>,
}

impl<M> Ctx<'_, M> {
    pub(crate) fn metrics(&self) -> &Metrics {
        &self.env.metrics
    }
}
