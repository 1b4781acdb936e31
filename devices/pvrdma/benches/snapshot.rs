// SPDX-License-Identifier: Apache-2.0
//! Device quiesce + save + restore time against the number of QPs (issue
//! 6's in-process figure): a simulated driver brings N RC QPs to RTS, then
//! the device is paused, snapshotted, encoded, and restored into a new
//! device (`SimDriver::migrate`). Baseline in the same run: encoding and
//! decoding the same bytes alone (what any state transfer costs).
//! Run: `cargo bench -p pvrdma --bench snapshot`.

use std::time::Instant;

use pvrdma::sim_driver::{QpSpec, SimDriver, GID};
use pvrdma_abi::verbs::qp_type;
use vm_migration::{Pausable, Snapshot, Snapshottable};

fn main() {
    println!("QPs   snapshot bytes   pause+save   encode+decode alone   migrate (pause, save, new device, restore)");
    // 1022: of the device's 1024 QP handles, 0 is never used and 1 is the GSI QP's.
    for n in [1u32, 16, 256, 1022] {
        let mut sim = SimDriver::new();
        sim.probe().expect("probe");
        sim.bind_gid(0, GID, 2).expect("bind");
        let pd = sim.create_pd(0).expect("pd");
        let cq = sim.create_cq(0, 64).expect("cq");
        for _ in 0..n {
            let qp = sim.create_qp(QpSpec::rc(pd, cq.handle)).expect("qp");
            sim.to_rts(qp.handle, qp_type::RC).expect("RTS");
        }
        let t0 = Instant::now();
        sim.device().pause().expect("pause");
        let snap = sim.device().snapshot().expect("snapshot");
        let save = t0.elapsed();
        sim.device().resume().expect("resume");
        let t1 = Instant::now();
        let bytes = snap.to_bytes();
        let back = Snapshot::from_bytes(&bytes).expect("decode");
        assert_eq!(back, snap);
        let codec = t1.elapsed();
        let t2 = Instant::now();
        let sim = sim.migrate();
        let migrate = t2.elapsed();
        assert!(sim.metric("cmd_executed") == 0, "a fresh device, restored");
        println!(
            "{n:<5} {:>14}   {:>9.2} ms   {:>16.2} ms   {:>10.2} ms",
            bytes.len(),
            save.as_secs_f64() * 1e3,
            codec.as_secs_f64() * 1e3,
            migrate.as_secs_f64() * 1e3
        );
    }
}
