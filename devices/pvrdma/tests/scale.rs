// SPDX-License-Identifier: Apache-2.0
//! Issue 16's scale: a device with the default limits holds 4096 busy RC
//! QPs, and they survive a live migration with their QPNs and keys.

use pvrdma::sim_driver::fleet::Fleet;
use pvrdma::Limits;

const QPS: usize = 4096;

/// 4096 RC QPs created through the simulated driver under the default
/// limits (besides the GSI QP), connected to a peer device, traffic on a
/// sample of 64; the device is migrated twice and the sample carries on:
/// a SEND from each QP (its peer acknowledges to the QPN it knew) and an
/// RDMA WRITE into its MR under the rkey handed out before the
/// migrations.
#[test]
fn default_limits_hold_4096_qps_across_migrations() {
    assert!(Limits::default().max_qp as usize >= QPS + 2);
    let mut fleet = Fleet::new(QPS);
    assert_eq!(Fleet::config(QPS).limits, Limits::default());
    let sample: Vec<usize> = (0..QPS).step_by(QPS / 64).chain([QPS - 1]).collect();
    fleet.exchange(&sample, 0);
    for round in 1..=2 {
        fleet = fleet.migrate_a();
        fleet.exchange(&sample, round);
    }
    assert_eq!(fleet.a.sim.metric("cmd_executed"), 0, "a fresh device");
}
