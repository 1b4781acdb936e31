// SPDX-License-Identifier: Apache-2.0
//! Helpers shared by the integration tests.
#![allow(dead_code)]

use pvrdma::sim_driver::{Failure, SimCq, SimDriver, GID};
use pvrdma::PvrdmaConfig;
use pvrdma_abi::cmd::CmdCode;

pub const EPERM: Failure = Failure::Err(1);
pub const ENOMEM: Failure = Failure::Err(12);
pub const EFAULT: Failure = Failure::Err(14);
pub const EBUSY: Failure = Failure::Err(16);
pub const EINVAL: Failure = Failure::Err(22);
pub const EOPNOTSUPP: Failure = Failure::Err(95);

/// A probed device.
pub fn ready() -> SimDriver {
    ready_with(&PvrdmaConfig::default())
}

pub fn ready_with(config: &PvrdmaConfig) -> SimDriver {
    let mut sim = SimDriver::with_config(config);
    sim.probe().expect("probe");
    sim
}

/// A probed device with GID 0 bound, a kernel PD and a kernel CQ.
pub fn with_pd_cq() -> (SimDriver, u32, SimCq) {
    let mut sim = ready();
    sim.bind_gid(0, GID, 2).expect("bind");
    let pd = sim.create_pd(0).expect("pd");
    let cq = sim.create_cq(0, 64).expect("cq");
    (sim, pd, cq)
}

/// Checks the device still executes commands after a hostile one.
pub fn assert_healthy(sim: &mut SimDriver) {
    let pd = sim.create_pd(0).expect("device still works");
    sim.destroy(CmdCode::DestroyPd, pd).expect("destroy");
}
